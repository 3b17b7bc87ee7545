# Sourced by the scripts that run the `metronome` binary on the GPU machine:
# puts BIN_DIR/lib (the carried non-CUDA libraries) and the device's own
# cuBLAS (the CUDA toolkit's, or the one Python's nvidia packages ship) on
# LD_LIBRARY_PATH.   . tools/device/binary_env.sh BIN_DIR
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s) for p in nvidia.__path__ for s in ("cu13/lib", "cublas/lib")))' 2>/dev/null); do
  if [ -e "$d/libcublas.so.13" ]; then cublas_dir=$d; break; fi
done
export LD_LIBRARY_PATH="$1/lib:$cublas_dir:${LD_LIBRARY_PATH:-}"
# NCCL for tensor parallelism over several GPUs (gpu/collective.hpp loads it
# at run time): the toolkit's, or the one Python's nvidia packages ship.
if [ -z "${METRONOME_NCCL_LIBRARY:-}" ]; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s) for p in nvidia.__path__ for s in ("cu13/lib", "nccl/lib")))' 2>/dev/null); do
    if [ -e "$d/libnccl.so.2" ]; then export METRONOME_NCCL_LIBRARY="$d/libnccl.so.2"; break; fi
  done
fi
