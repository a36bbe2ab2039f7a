from membench.techniques.base import Technique


class InitOnDevice(Technique):
    """Trades nothing at run time for a lower construction peak: the model is built directly on the target
    device at the target dtype (a device context and a default dtype), instead of in fp32 in host memory and
    then cast and moved. Construction never holds an fp32 host copy, nor two copies during the cast.

    On CUDA the initial values are drawn by the device's random generator, so they differ from the baseline's
    host draw: the equivalence check then starts both from the baseline's initial values (same_init = False).
    """

    name = "init-on-device"
    summary = "build the model on the device at its target dtype: lower construction peak, no host fp32 copy"
    same_init = False
    order = 5  # builds the model before any other technique could (bf16 builds host-then-cast otherwise)

    def build_model(self, build, device):
        import torch

        dtype = getattr(torch, self.target_dtype())
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                return build()
        finally:
            torch.set_default_dtype(previous)

    def target_dtype(self) -> str:
        """The name of the torch dtype the model is built at."""
        return self.stack_param_dtype or "float32"
