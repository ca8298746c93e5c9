"""Kept for ``integrations/setting.py``, which imports this name from here."""

from .compose import NO_DEPLOYMENT as NO_DEPLOYMENT
