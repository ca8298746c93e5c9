"""Helpers the package's folders share, in Hydra's manner: not API, and free to change.

``limits`` checks a number against its bounds and words the refusal; ``floor`` picks a
workspace's floor and says which setting won; ``devices`` reads a device setting; ``table``
prints aligned tables.
"""
