# Sourced by the scripts that run on a lent device machine (gpu_check.sh, amx_check.sh,
# amx_peers.sh), from the repository root, with the name of their output folder: makes $OUT
# (default /tmp/<name>), installs the wheels `gpu_check.sh prepare` put in .gpu/whl (the
# machine has no internet) into /tmp/site, puts the repository and them on PYTHONPATH, and
# defines cpu_summary (the host CPU's model, its vector / matrix flags and the compiler).
OUT=${OUT:-/tmp/$1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}

cpu_summary() {
  grep -m1 "model name" /proc/cpuinfo
  grep -o -E 'avx512[a-z_0-9]*|avx2|amx[a-z_0-9]*|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '
  echo
  g++ --version | head -1
}
