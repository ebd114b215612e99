"""A run: the driver's loop, the pure policy it asks, the events it tells and the live view.
Imports `_core`, `spec`, `gpus`, `trial`, `launch`, `study` and `schedulers`."""
