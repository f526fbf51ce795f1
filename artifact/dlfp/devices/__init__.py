"""Device models: model and GPU specs, the roofline cost model, the fitted CPU model, and host costs."""
