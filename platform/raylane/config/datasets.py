"""The ``datasets:`` and ``data_config:`` sections of a training spec (``kind: train``): the named Ray Data sources
Ray Train hands its workers (``ray.train.get_dataset_shard(name)``), and how Train splits them among the workers.

This module owns the schema of those two sections: field names, which fields go with which source, and the checks
that need only the spec. It reads no files and imports no Ray: whether a path exists or a function imports is
checked at submit by ``raylane.launchers.datasets`` (run by ``raylane.launchers.check``), which also builds the
Ray Datasets when the gang starts. It builds on the field types of ``raylane.config.fields`` and is what
``WorkloadSpec.datasets`` and ``WorkloadSpec.data_config`` hold.

Words
- *source*: one entry of ``datasets:``, either a *file source* (``format`` and ``path``: read with
  ``ray.data.read_<format>``) or a *function source* (``function: module:function``, called on the driver with
  ``kwargs``, returning a ``ray.data.Dataset``).
- *path*: a file or folder, or a list of them; relative paths are relative to the job's working directory (the
  ``--working-dir`` of ``ray job submit``), and a path with a scheme (``s3://``, ``gs://``, ``local://``) is
  handed to Ray Data as written.
- *split*: a dataset named in ``data_config.datasets_to_split`` is divided among the workers (each reads a
  disjoint shard); any other is read whole by every worker (Ray Train's ``DataConfig``).

Every error names the field (``datasets.train.path``), the bad value and what is allowed; unknown fields are errors.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Callable, Dict, List, Optional, Tuple, Union

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, WrapValidator, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core import ValidationError as CoreValidationError

from raylane.config.fields import Allowed, Memory, NonNegative, StrictModel
from raylane.config.fields import error as _err
from raylane.config.fields import matching as _matching
from raylane.config.fields import one_of as _one_of

__all__ = [
    "FORMATS",
    "READERS",
    "FORMAT_OPTIONS",
    "IMAGE_MODES",
    "DatasetSource",
    "ResourceLimitsSpec",
    "ExecutionOptionsSpec",
    "DataConfigSpec",
    "split_name_errors",
]

# Format -> the ray.data function that reads it (tests/config/test_datasets_spec.py keeps these and FORMAT_OPTIONS
# equal to the installed Ray's signatures).
READERS: Dict[str, str] = {"parquet": "read_parquet", "csv": "read_csv", "json": "read_json", "images": "read_images"}
FORMATS: Tuple[str, ...] = tuple(READERS)
# Reader options a file source may set (passed to ray.data.read_<format> under the same name) -> the formats whose
# reader takes them.
FORMAT_OPTIONS: Dict[str, Tuple[str, ...]] = {
    "columns": ("parquet",),
    "size": ("images",),
    "mode": ("images",),
    "include_paths": FORMATS,
    "file_extensions": FORMATS,
    "override_num_blocks": FORMATS,
}
# The PIL modes read_images converts to (the common ones; PIL knows a few more that no training set uses).
IMAGE_MODES: Tuple[str, ...] = ("1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV", "I", "F")

DATASET_NAME_ALLOWED = ("a dataset name of at most 63 letters, digits, '_', '-' and '.', starting with a letter, "
                        "digit or '_' (the name the loop passes to ray.train.get_dataset_shard)")
DatasetName = _matching("dataset_name", r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}", DATASET_NAME_ALLOWED)

FUNCTION_ALLOWED = ("'package.module:function' returning a ray.data.Dataset (a module importable from the job's "
                    "working directory or an installed package)")
FunctionRef = _matching("function", r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", FUNCTION_ALLOWED)

PATH_ALLOWED = ("a file or folder (relative to the job's working directory, or a URI such as s3://bucket/key), "
                "or a non-empty list of them")


def _check_paths(value: Any) -> Union[str, List[str]]:
    def one(p: Any) -> bool:
        return isinstance(p, str) and bool(p.strip()) and "\x00" not in p

    if one(value) or (isinstance(value, list) and value and all(one(p) for p in value)):
        return value
    raise _err("path", PATH_ALLOWED)


Paths = Annotated[Union[str, List[str]], BeforeValidator(_check_paths), Allowed(PATH_ALLOWED)]
FormatName = _one_of(FORMATS)
ImageMode = _one_of(IMAGE_MODES)
SIZE_ALLOWED = "[height, width]: two integers >= 1, the size every image is resized to"


def _check_size(value: Any) -> Tuple[int, int]:
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in value)):
        return (value[0], value[1])
    raise _err("size", SIZE_ALLOWED)


ImageSize = Annotated[Tuple[int, int], BeforeValidator(_check_size), Allowed(SIZE_ALLOWED)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class DatasetSource(StrictModel):
    """One named dataset: ``{format, path}`` (plus the reader options of that format) or ``{function, kwargs}``."""

    # Declared first: the checks of the fields below read it.
    function: Optional[FunctionRef] = None
    # Keyword arguments the function is called with (function sources only).
    kwargs: Dict[str, Any] = Field(default_factory=dict)
    format: Optional[FormatName] = Field(default=None, validate_default=True)
    path: Optional[Paths] = Field(default=None, validate_default=True)
    # Reader options (FORMAT_OPTIONS says which format takes which).
    columns: Optional[List[NonEmptyStr]] = Field(default=None, min_length=1)
    size: Optional[ImageSize] = None
    mode: Optional[ImageMode] = None
    include_paths: Optional[bool] = None
    file_extensions: Optional[List[NonEmptyStr]] = Field(default=None, min_length=1)
    override_num_blocks: Optional[Annotated[int, Field(ge=1)]] = None

    @field_validator("kwargs")
    @classmethod
    def _kwargs_of_a_function(cls, v: Dict[str, Any], info: ValidationInfo) -> Dict[str, Any]:
        if v and "function" in info.data and info.data["function"] is None:
            raise _err("kwargs", "only with function: the keyword arguments it is called with (a file source takes "
                                 "its format's reader options instead)")
        return v

    @field_validator("format")
    @classmethod
    def _format_or_function(cls, v: Optional[str], info: ValidationInfo) -> Optional[str]:
        if "function" not in info.data:  # the function has an error of its own
            return v
        function = info.data["function"]
        if v is None and function is None:
            raise _err("source", f"required: a format ({', '.join(FORMATS)}) with a path, or function: "
                                 f"{FUNCTION_ALLOWED}")
        if v is not None and function is not None:
            raise _err("source", "either format and path (a file source) or function (a function source), not both")
        return v

    @field_validator("path")
    @classmethod
    def _path_with_format(cls, v: Any, info: ValidationInfo) -> Any:
        if "format" not in info.data:
            return v
        fmt = info.data["format"]
        if fmt is not None and v is None:
            raise _err("path", f"required with format {fmt}: {PATH_ALLOWED}")
        if fmt is None and v is not None and info.data.get("function") is not None:
            raise _err("path", "only with format (a file source); a function source reads what it likes")
        return v

    @field_validator(*FORMAT_OPTIONS)
    @classmethod
    def _option_of_the_format(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None or "format" not in info.data:
            return v
        fmt, takes = info.data["format"], FORMAT_OPTIONS[info.field_name]
        if fmt not in takes:
            what = f"format {fmt}" if fmt is not None else "a function source"
            raise _err("option", f"only with format {' or '.join(takes)} (ray.data.{READERS[takes[0]]} reads it); "
                                 f"{what} does not take {info.field_name}")
        return v

    def reader_options(self) -> Dict[str, Any]:
        """The keyword arguments of ``ray.data.read_<format>`` besides the paths."""
        out = {k: getattr(self, k) for k in FORMAT_OPTIONS if getattr(self, k) is not None}
        if "size" in out:
            out["size"] = tuple(out["size"])
        return out


class ResourceLimitsSpec(StrictModel):
    """``ray.data.ExecutionResources.for_limits``: what Ray Data may use while it feeds the workers (null: no limit)."""

    cpu: Optional[NonNegative] = None
    gpu: Optional[NonNegative] = None
    memory: Optional[Memory] = None
    object_store_memory: Optional[Memory] = None


class ExecutionOptionsSpec(StrictModel):
    """``ray.data.ExecutionOptions`` applied to every dataset's shards (Train's default ingest options otherwise)."""

    resource_limits: ResourceLimitsSpec = Field(default_factory=ResourceLimitsSpec)
    preserve_order: bool = False
    # null: RAY_DATA_VERBOSE_PROGRESS decides, as in Ray.
    verbose_progress: Optional[bool] = None


SPLIT_ALLOWED = "all (every dataset is split among the workers), or a list of dataset names"


def _check_split(value: Any, handler: Callable[[Any], Any]) -> Any:
    """``all`` or a list of names; one error, not one per arm of a union."""
    if value == "all":
        return value
    if not isinstance(value, list):
        raise _err("split", SPLIT_ALLOWED)
    return handler(value)


DatasetsToSplit = Annotated[Union[str, List[DatasetName]], WrapValidator(_check_split), Allowed(SPLIT_ALLOWED)]


class DataConfigSpec(StrictModel):
    """Ray Train's ``DataConfig``: which datasets are split among the workers, and Ray Data's execution options."""

    datasets_to_split: DatasetsToSplit = "all"
    # Split shards are assigned with the workers' nodes in mind, to keep reads node-local (Ray's default).
    enable_shard_locality: bool = True
    execution_options: Optional[ExecutionOptionsSpec] = None


def split_name_errors(data_config: DataConfigSpec, datasets: Dict[str, Any]) -> Optional[CoreValidationError]:
    """The names in ``data_config.datasets_to_split`` that ``datasets`` does not declare, as a pydantic error whose
    locations (``datasets_to_split[i]``) the enclosing field's validator prefixes with its own; None when all are."""
    split = data_config.datasets_to_split
    if split == "all":
        return None
    known = ", ".join(datasets) or "(none declared)"
    bad: List[InitErrorDetails] = []
    for i, name in enumerate(split):
        if name not in datasets:
            bad.append(InitErrorDetails(type=PydanticCustomError("raylane_split", f"a name of datasets: {known}"),
                                        loc=("datasets_to_split", i), input=name))
        elif name in split[:i]:
            bad.append(InitErrorDetails(type=PydanticCustomError("raylane_split", "each name once"),
                                        loc=("datasets_to_split", i), input=name))
    return CoreValidationError.from_exception_data("DataConfigSpec", bad) if bad else None
