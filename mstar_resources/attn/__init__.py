"""Attention resources: FlashInfer's workspaces (``workspace``), and what they read of FlashInfer
(``_flashinfer``). Importing the package imports neither torch nor the workspaces, so that a
torch-free check (calibration's FlashInfer versions, the dry runs) can read ``_flashinfer``."""
