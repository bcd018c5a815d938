// placeholder until the CUDA device lands
