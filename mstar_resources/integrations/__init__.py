"""Engine integrations: the library inside an engine's process, through its plugin seams. Nothing
else in the package imports them, and each imports its engine only once it is enabled."""
