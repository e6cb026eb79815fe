#include "cycle_b.cuh"
