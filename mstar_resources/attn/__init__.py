"""FlashInfer's workspaces; importing this package imports no torch (``_flashinfer`` says why)."""
