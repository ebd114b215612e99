"""The study file, read once into a frozen `Spec`: its sections (`schema`), `load`
(`config`) and the checks across sections (`checks`), the search space, the accelerate config
file, the trainer's interpreter, the storage URL. Imports `_core` and `protocol` only; reads
files, never writes one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep._core import face

if TYPE_CHECKING:
    from sweep.spec.accelconfig import ConfigFileError
    from sweep.spec.checks import env_name
    from sweep.spec.container import ContainerSection, Engine, Mount, image_path, is_path_image
    from sweep.spec.interpreter import Interpreter, InterpreterError
    from sweep.spec.scheduler import AshaScheduler, HyperbandScheduler, PbtScheduler, Scheduler
    from sweep.spec.schema import ReportSection, Spec, TrainerSection
    from sweep.spec.searchspace import BoolParam, CategoricalParam, FloatParam, IntParam, Searched
    from sweep.spec.storageurl import StorageKind, StorageUrl, StorageUrlError, storage_identity

__all__, _face = face(__name__)
if not TYPE_CHECKING:
    __getattr__ = _face
