"""FlashInfer's workspaces (``workspace``) and what they read of FlashInfer (``_flashinfer``).
Importing the package imports no torch, so that torch-free checks can read ``_flashinfer``."""
