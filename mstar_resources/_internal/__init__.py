"""Helpers the package's folders share, in Hydra's manner: not API, and free to change."""
