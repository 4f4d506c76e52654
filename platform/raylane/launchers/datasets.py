"""The datasets of a training spec, checked at submit and built into Ray Datasets when the gang starts.

This module owns the two things the schema (``raylane.config.datasets``) cannot do alone:

- ``source_errors``: the submit-time checks (run by ``raylane.launchers.check``, so by ``raylane spec check`` and
  by the driver before anything queues): every local path exists relative to the working directory, every
  function imports, is callable, and takes the ``kwargs`` the spec gives it. Imports no Ray.
- ``build``: the ``datasets=`` and ``dataset_config=`` of the ``TorchTrainer`` (``raylane.launchers.train``), built
  on the driver once per attempt. Imports ``ray.data`` and ``ray.train`` only here.

Words
- *local path*: a path with no scheme, or with ``local://`` or ``file://``; it is checked at submit and made
  absolute (against the working directory) before Ray Data sees it, so that read tasks on any node read the same
  file (Ray unpacks a job's working directory at one path on every node). Any other scheme (``s3://``, ``gs://``,
  ``hdfs://``...) is handed to Ray Data as written and not checked at submit: the submitting machine may hold no
  credentials for it.

Ray Data's read tasks run outside the gang's reservation, on the cluster's free CPUs (Ray Train keeps its workers'
resources out of Ray Data's budget); the datasets do not change the gang's resources, its quota or its placement.
"""
from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from raylane.config.datasets import READERS, DataConfigSpec, DatasetSource
from raylane.errors import FatalError, ValidationError

__all__ = ["TrainData", "DatasetBuildError", "source_errors", "resolve_path", "build"]

ErrorList = List[Tuple[str, Any, str]]

_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
LOCAL_SCHEMES = ("local", "file")
GiB = 1 << 30


class DatasetBuildError(FatalError):
    """Building a dataset on the driver failed (its function raised, or returned no ``ray.data.Dataset``)."""


@dataclass(frozen=True)
class TrainData:
    """What the trainer is handed: ``datasets`` (name -> ``ray.data.Dataset``) and ``data_config`` (a
    ``ray.train.DataConfig``, or None for Ray Train's default: every dataset split among the workers)."""

    datasets: Dict[str, Any]
    data_config: Any = None


def resolve_path(path: str, working_dir: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """(what Ray Data is given, the local file to check or None): a local path made absolute against
    ``working_dir`` (default: the current directory), keeping its ``local://`` prefix; a remote URI unchanged."""
    m = _SCHEME.match(path)
    if m and m.group("scheme").lower() not in LOCAL_SCHEMES:
        return path, None
    prefix = m.group(0) if m else ""
    rest = os.path.expanduser(path[len(prefix):])
    local = os.path.normpath(os.path.join(os.path.abspath(working_dir or os.getcwd()), rest))
    # file:// is what pyarrow reads as a local path too; Ray Data takes the bare path for it.
    return (("local://" + local) if prefix.lower().startswith("local") else local), local


def _paths(source: DatasetSource) -> List[str]:
    return [source.path] if isinstance(source.path, str) else list(source.path or [])


def _sources(datasets: Mapping[str, Any]) -> Dict[str, DatasetSource]:
    """The sources that are valid (a source with errors of its own is reported by the spec's schema)."""
    import pydantic

    out = {}
    for name, raw in (datasets or {}).items():
        try:
            out[name] = raw if isinstance(raw, DatasetSource) else DatasetSource.model_validate(raw)
        except pydantic.ValidationError:
            continue
    return out


def source_errors(datasets: Mapping[str, Any], *, working_dir: Optional[str] = None,
                  load_code: bool = True) -> ErrorList:
    """Every problem of the spec's ``datasets`` that submission finds, as (field path, value, allowed): local paths
    that do not exist, functions that do not import, are not callable or do not take the given ``kwargs``. With
    ``load_code=False`` (a machine without the user's project) nothing is checked here."""
    if not load_code or not isinstance(datasets, Mapping):  # not a mapping: the spec's schema says so
        return []
    from raylane import entrypoints

    wd = os.path.abspath(working_dir or os.getcwd())
    errors: ErrorList = []
    for name, src in _sources(datasets).items():
        field = f"datasets.{name}"
        if src.format is not None:
            paths = _paths(src)
            for i, p in enumerate(paths):
                _, local = resolve_path(p, wd)
                if local is not None and not os.path.exists(local):
                    where = f"{field}.path" + (f"[{i}]" if not isinstance(src.path, str) else "")
                    errors.append((where, p, f"an existing file or folder for ray.data.{READERS[src.format]}: "
                                             f"{local} does not exist (a relative path is relative to the working "
                                             f"directory, {wd})"))
            continue
        try:
            with entrypoints.on_path(wd):
                fn = entrypoints.load(src.function, None, field=f"{field}.function")
        except ValidationError as exc:
            errors.extend(exc.errors)
            continue
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failing while it is imported
            errors.append((f"{field}.function", src.function, f"importing it failed: {type(exc).__name__}: {exc}"))
            continue
        if inspect.isclass(fn) or not callable(fn):
            what = f"class {fn.__name__}" if inspect.isclass(fn) else f"{type(fn).__name__} {fn!r:.60}"
            errors.append((f"{field}.function", src.function,
                           f"a function returning a ray.data.Dataset; it is {what}, not a function"))
            continue
        try:
            inspect.signature(fn).bind(**src.kwargs)
        except TypeError as exc:
            errors.append((f"{field}.kwargs", src.kwargs,
                           f"the keyword arguments {src.function} takes ({exc}); it is called with kwargs only"))
        except ValueError:  # a builtin without a signature: let it be called
            pass
    return errors


def build(spec: Mapping[str, Any], *, working_dir: Optional[str] = None) -> Optional[TrainData]:
    """The Ray Datasets and the ``DataConfig`` of ``spec`` (None when it declares no datasets). Runs on the driver
    (``working_dir``: the job's, default the current directory). ``DatasetBuildError`` names the dataset whose
    function failed or returned something else than a ``ray.data.Dataset``."""
    declared = spec.get("datasets") or {}
    if not declared:
        return None
    import ray.data

    from raylane import entrypoints

    wd = os.path.abspath(working_dir or os.getcwd())
    sources = {name: raw if isinstance(raw, DatasetSource) else DatasetSource.model_validate(raw)
               for name, raw in declared.items()}
    built: Dict[str, Any] = {}
    for name, src in sources.items():
        if src.format is not None:
            paths = [resolve_path(p, wd)[0] for p in _paths(src)]
            reader = getattr(ray.data, READERS[src.format])
            try:
                built[name] = reader(paths if len(paths) > 1 else paths[0], **src.reader_options())
            except Exception as exc:  # noqa: BLE001 - e.g. a file removed since submit: named, with Ray's error
                raise DatasetBuildError(f"datasets.{name}: ray.data.{READERS[src.format]}({paths}) raised "
                                        f"{type(exc).__name__}: {exc}") from exc
            continue
        with entrypoints.on_path(wd):
            fn = entrypoints.load(src.function, None, field=f"datasets.{name}.function")
        try:
            ds = fn(**src.kwargs)
        except Exception as exc:  # noqa: BLE001 - the user's function failing: named, with its error
            raise DatasetBuildError(f"datasets.{name}: {src.function} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(ds, ray.data.Dataset):
            raise DatasetBuildError(f"datasets.{name}: {src.function} returned {type(ds).__name__}, not a "
                                    f"ray.data.Dataset")
        built[name] = ds
    return TrainData(datasets=built, data_config=_data_config(spec.get("data_config")))


def _data_config(raw: Any) -> Any:
    """``ray.train.DataConfig`` of the spec's ``data_config`` (None: Ray Train's default)."""
    if raw is None:
        return None
    from ray.data import ExecutionOptions, ExecutionResources
    from ray.train import DataConfig

    dc = raw if isinstance(raw, DataConfigSpec) else DataConfigSpec.model_validate(raw)
    options = None
    if dc.execution_options is not None:
        eo, lim = dc.execution_options, dc.execution_options.resource_limits
        options = ExecutionOptions(
            resource_limits=ExecutionResources.for_limits(
                cpu=lim.cpu, gpu=lim.gpu,
                object_store_memory=None if lim.object_store_memory is None else lim.object_store_memory * GiB,
                memory=None if lim.memory is None else lim.memory * GiB),
            preserve_order=eo.preserve_order, verbose_progress=eo.verbose_progress)
    split = dc.datasets_to_split if dc.datasets_to_split == "all" else list(dc.datasets_to_split)
    return DataConfig(datasets_to_split=split, execution_options=options,
                      enable_shard_locality=dc.enable_shard_locality)
