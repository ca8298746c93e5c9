"""Replay a serving trace through an engine's loop on a GPU: see mstar_resources/apps/replay.py.

python scripts/replay.py deployment=llama3-8b-h200_calibrated
python scripts/replay.py deployment=llama3-8b-h200_calibrated report_dir=/tmp/replay
torchrun --nproc-per-node 2 scripts/replay.py deployment=llama3-8b-h200_calibrated
"""

from mstar_resources.apps.replay import main

if __name__ == "__main__":
    main()
