"""The study file, read once into a frozen `Spec`: its sections (`schema`), `load`
(`config`) and the checks across sections (`checks`), the search space, the accelerate config
file, the trainer's interpreter, the storage URL. Imports `_core` and `protocol` only; reads
files, never writes one."""
