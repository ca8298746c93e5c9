"""Kept for ``integrations/vllm/workspaces.py``, which imports this name from here."""

from .profile import installed_flashinfer as installed_flashinfer
