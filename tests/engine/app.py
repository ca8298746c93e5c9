"""An engine's entry point: composes its config under ``@hydra.main`` and prints the resolved
resources as JSON (``{"model": ..., "resources": [...]}``)."""

from __future__ import annotations

import dataclasses
import json

import hydra
from omegaconf import DictConfig

from mstar_resources import resolve


@hydra.main(version_base="1.3", config_path="conf", config_name="engine")
def main(cfg: DictConfig) -> None:
    records = resolve(cfg.resources)
    print(
        json.dumps({"model": cfg.model.name, "resources": [dataclasses.asdict(r) for r in records]})
    )


if __name__ == "__main__":
    main()
