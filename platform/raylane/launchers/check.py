"""Every check a workload spec gets before anything queues, its user code included.

``raylane spec check``, ``raylane submit`` (through ``raylane.codecheck``), a pipeline's check of its stages
(``raylane.pipelines.driver.check``) and the driver (``raylane.run``) run these, so they refuse the same specs:

1. the spec's own fields, and its team, class and features against a policy when one is given
   (``raylane.config.loader``);
2. its code: the entrypoint or command is there and fits the kind, the config fits the entrypoint's declared schema
   (``raylane.entrypoints``), and the training datasets' files and functions are there
   (``raylane.launchers.datasets``);
3. what the kind's launcher checks beyond that (``raylane.launchers.precheck``: a one-shot's config, a sweep's
   trainable, a service's deployment, the fault drills).

Every problem of one spec is raised at once, in one ``ValidationError``. The code is imported from ``working_dir``
unless ``load_code`` is false (a machine without the user's project: only the form is checked). This lives with the
launchers because step 3 is theirs; ``raylane.config`` reads a spec without importing anyone's code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple, Union

from raylane import entrypoints
from raylane.config.loader import read_yaml, spec_and_errors
from raylane.config.models import DEFAULT_KIND, ClusterPolicy, WorkloadSpec
from raylane.errors import ValidationError
from raylane.launchers import precheck
from raylane.launchers.datasets import source_errors

__all__ = ["check_code", "check_spec_dict", "check_spec_file"]

ErrorList = List[Tuple[str, Any, str]]
_CODE_FIELDS = ("kind", "entrypoint", "command", "config")


def check_spec_file(path: Union[str, Path], policy: Optional[ClusterPolicy] = None, *,
                    working_dir: Union[str, Path, None] = None, load_code: bool = True) -> WorkloadSpec:
    """The workload spec in ``path`` with every check (see ``check_spec_dict``). Raises ``NotFoundError`` or
    ``ValidationError``."""
    p = Path(path)
    data, dups = read_yaml(p, "spec file")
    return check_spec_dict(data, str(p), policy=policy, working_dir=working_dir, load_code=load_code, _extra=dups)


def check_spec_dict(data: Any, source: str = "spec", *, policy: Optional[ClusterPolicy] = None,
                    working_dir: Union[str, Path, None] = None, load_code: bool = True,
                    _extra: ErrorList = ()) -> WorkloadSpec:
    """A ``WorkloadSpec`` from parsed YAML with every check submission runs: ``load_spec_from_dict``'s, then the
    user's code and the kind's own checks, importing the code from ``working_dir`` unless ``load_code`` is false.
    ``ValidationError`` with every problem."""
    spec, errors = spec_and_errors(data, source, policy=policy, _extra=_extra)
    if isinstance(data, Mapping):
        errors.extend(_code_errors(spec, data, errors, working_dir=working_dir, load_code=load_code))
    if errors:
        raise ValidationError(source, errors)
    return spec


def check_code(spec: Mapping[str, Any], *, working_dir: Optional[str] = None, load_code: bool = True) -> Any:
    """Every check of a spec's code that submission runs: the entrypoint or command and its config
    (``raylane.entrypoints.check_spec``) and the training datasets' files and functions
    (``raylane.launchers.datasets.source_errors``), their problems raised together in one ``ValidationError``.
    Returns the loaded entrypoint (None for a command or a kind that runs no user code)."""
    data_errors: ErrorList = []
    if spec.get("datasets"):
        data_errors = source_errors(spec["datasets"], working_dir=working_dir, load_code=load_code)
    try:
        obj = entrypoints.check_spec(spec, working_dir=working_dir, load_code=load_code)
    except ValidationError as exc:
        if data_errors:
            raise ValidationError(exc.source, exc.errors + data_errors) from None
        raise
    if data_errors:
        raise ValidationError("spec", data_errors)
    return obj


def _code_errors(spec: Optional[WorkloadSpec], data: Mapping, errors: ErrorList, *,
                 working_dir: Union[str, Path, None], load_code: bool) -> ErrorList:
    """The errors of ``check_code`` and of the kind's ``precheck`` for the spec's code fields; none checked while one
    of them has an error of its own already (the code check would only repeat it)."""
    if any(str(p).split(".")[0].split("[")[0] in _CODE_FIELDS for p, _, _ in errors):
        return []
    if spec is not None:
        fields = {"kind": spec.kind, "entrypoint": spec.entrypoint, "command": spec.command, "config": spec.config}
    else:
        fields = {f: data.get(f) for f in _CODE_FIELDS}
        fields["kind"] = fields["kind"] or DEFAULT_KIND
    fields = {k: v for k, v in fields.items() if v is not None}
    datasets = data.get("datasets")  # its files and functions (raylane.launchers.datasets), unless refused already
    refused = any(str(p).split(".")[0] == "datasets" for p, _, _ in errors)
    if isinstance(datasets, Mapping) and datasets and not refused:
        fields["datasets"] = dict(datasets)
    wd = str(working_dir) if working_dir else None
    try:
        check_code(fields, working_dir=wd, load_code=load_code)
    except ValidationError as exc:
        return exc.errors
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code failing while it is checked
        field = "entrypoint" if "entrypoint" in fields else "command"
        return [(field, fields.get(field), f"checking it failed: {type(exc).__name__}: {exc}")]
    if spec is None or not load_code:
        return []
    try:  # what the kind's launcher checks before anything queues (the one-shot config, a sweep's trainable...)
        precheck(spec, data, working_dir=wd)
    except ValidationError as exc:
        return exc.errors
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code failing while it is checked
        return [("kind", spec.kind, f"checking the {spec.kind} section failed: {type(exc).__name__}: {exc}")]
    return []
