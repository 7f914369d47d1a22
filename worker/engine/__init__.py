"""The inference engine: requests, the tensor-free block pool and prefix cache, the scheduler,
the model runner (sole owner of device memory), and the engine step loop that wires them."""
