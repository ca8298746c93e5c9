"""Proof in an engine's loop: a serving trace replayed on sealed, calibrated pools, on one GPU or
on tensor-parallel ranks, against the engines' one fixed buffer (``scripts/replay.py``).

``trace``, ``workload`` and ``scheduler`` are plain Python (the requests, and what runs each
step); ``roles`` says which plan labels the replay plans; ``model`` and ``engine`` run it on a GPU;
``report`` prints and writes what it found; ``cli`` is the Hydra app and ``settings`` its
settings.
"""
