"""The study file, read once into a frozen `Spec`: its sections and their checks (`config`),
the search space, the accelerate config file, the trainer's interpreter, the storage URL.
Imports `_core` and `protocol` only; reads files, never writes one."""
