"""Loading the model: finding and converting it (loader), the CPU's weight routes (quantize) and
the 2-layer fake model the fast tests run on."""
