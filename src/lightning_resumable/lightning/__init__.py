"""The Lightning layer: the callback and the mixin, the owners of the train input's position, preemption,
validation and Fabric."""
