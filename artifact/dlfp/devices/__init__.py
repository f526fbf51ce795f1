"""Device models: model and GPU specs, batch features, the roofline cost model, the fitted CPU model, host costs,
and the operator-level model held against measured GPU operator times (``operators``, ``attention``)."""
