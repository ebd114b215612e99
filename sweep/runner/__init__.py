"""A run: the driver's loop, the pure policy it asks, the events it tells and the live view.
Imports every package below it (`_core`, `spec`, `gpus`, `trial`, `study`)."""
