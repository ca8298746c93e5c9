"""``mstar-resources-calibrate deployment=NAME``: plan every label's bounding shapes on this GPU,
print what each needs, and write ``NAME_calibrated.yaml`` (``docs/calibration.md``)."""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ..calibration.calibrate import (
    DEFAULT_MARGIN,
    DEFAULT_OUTPUT_DIR,
    base_deployment,
    check_labels,
    how_to_compose,
    measure_all,
    one_buffer,
    per_resource,
    profile_settings,
    table,
    users_deployment_folder,
    write_override,
)
from ..calibration.profile import PROFILE_KEY, load_profile
from ..calibration.record import Machine, calibration_inputs, planned
from ..compose import ComposedTree
from ..errors import Problem, ResourceConfigError
from ..files import folder_problem
from ..resolver import resolve
from ..schema import WORKSPACE_MANAGER_LABEL
from .hydra_app import cuda_device, hydra_app, package_version

PROG = "mstar-resources-calibrate"
MAX_MARGIN = 10  # eleven times the need: more is a typo
MARGIN_EXPECTS = f"a fraction, at least 0 and at most {MAX_MARGIN}"


@dataclass
class CalibrateSettings(ComposedTree):
    """``mstar-resources-calibrate``'s settings, each told in the help of its primary config."""

    margin: float = field(default=DEFAULT_MARGIN, metadata={"expects": MARGIN_EXPECTS})
    device: str = field(default="cuda", metadata={"expects": "cuda or cuda:N"})
    output_dir: str | None = field(default=None, metadata={"expects": "a folder, or null"})
    progress: bool = field(default=True, metadata={"expects": "true or false"})


@hydra_app(
    PROG,
    config_name="mstar_resources_calibrate",
    compose_once=True,
    version=package_version,
    settings=CalibrateSettings,
)
def main(cfg: DictConfig) -> None:
    # Everything the config can get wrong is checked first, on any machine; then the GPU.
    deployment = HydraConfig.get().runtime.choices.get("deployment")
    if cfg.get(PROFILE_KEY) is None:
        raise ResourceConfigError(
            f"deployment={deployment} carries no `{PROFILE_KEY}` profile to calibrate; pick a "
            "deployment that has one (deployment=<name>)"
        )
    margin = cfg.margin
    if not 0 <= margin <= MAX_MARGIN:  # NaN too
        text = f"margin={margin!r} must be at least 0 and at most {MAX_MARGIN} (a fraction)"
        raise ResourceConfigError(
            Problem(text, setting="margin", value=margin, expects=MARGIN_EXPECTS)
        )
    profile = load_profile(cfg[PROFILE_KEY])
    records = resolve(cfg.resources)
    measured = planned(records)
    if unplanned := [f"resources.{r.path}" for r in records if r not in measured]:
        print(
            f"{PROG}: {', '.join(unplanned)} ({WORKSPACE_MANAGER_LABEL}) is vLLM's "
            "WorkspaceManager, which calibration does not measure: vLLM's memory profile grows "
            "it to what its largest batch takes; its floor stays as declared",
            file=sys.stderr,
        )
    check_labels(measured, profile)
    name = base_deployment(str(deployment))
    # Beside a --config-dir's deployment, which its defaults list: Hydra finds it only there.
    sources = HydraConfig.get().runtime.config_sources
    beside = users_deployment_folder(name, [s.path for s in sources if s.schema == "file"])
    output_dir = Path(cfg.output_dir) if cfg.output_dir else beside or DEFAULT_OUTPUT_DIR
    if problem := folder_problem(output_dir):
        raise ResourceConfigError(
            f"output_dir={str(output_dir)!r} can't take the calibrated deployment ({problem}); "
            "point it at a folder that exists or can be made"
        )
    if beside is not None and not (output_dir / f"{name}.yaml").is_file():
        raise ResourceConfigError(
            f"output_dir={str(output_dir)!r} does not hold {name}.yaml, which the calibrated "
            f"file lists under its defaults, and Hydra finds it only in the folder that holds "
            f"the calibrated file; leave output_dir out to write it beside {beside / name}.yaml, "
            f"or copy {name}.yaml into {output_dir}"
        )

    device = cuda_device(cfg.device, "calibration plans on a GPU")
    rows = measure_all(measured, profile, device, show_progress=cfg.progress)
    buffer = one_buffer(rows, profile, margin)
    print(table(rows, margin, buffer))
    record = {
        "deployment": name,
        **calibration_inputs(Machine.here(device), profile, records),
        "date": datetime.date.today().isoformat(),
    }
    given = profile_settings(cfg, HydraConfig.get().overrides.task)
    path = write_override(name, per_resource(rows), record, output_dir, margin, buffer, given)
    print(f"wrote {path}: {how_to_compose(path)}")


if __name__ == "__main__":
    main()
