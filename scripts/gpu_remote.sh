#!/usr/bin/env bash
# The lent GPU machine's side of `cargo xtask gpu-pack` (it has no Rust toolchain): unpack
# the binaries and trajectory that .gpu/ carries, make the checkout reachable at the path
# the tests were built in (they find tests/golden and models/ there), put the machine's
# NVRTC on the library path, and run `xtask gpu-check --prebuilt`. Logs go to $OUT.
#   device run: carry [".gpu", ".gl"], command: bash scripts/gpu_remote.sh /work/main
# Arguments after the path go to gpu-check (e.g. --only backends,cuda-trajectory-profile).
set -u
built_in=${1:?the checkout path the pack was built in (e.g. /work/main)}
here=$PWD
g=/tmp/lockstep-gpu
mkdir -p "$g"
python3 - <<PY || exit 1
import tarfile
for f in (".gpu/bin.tar.xz", ".gpu/data.tar.xz"):
    try:
        tarfile.open(f).extractall("$g")
    except FileNotFoundError:
        print("(no " + f + ")")
PY
if [ "$here" != "$built_in" ]; then
    if [ -e "$built_in" ] && [ ! -L "$built_in" ]; then
        echo "$built_in exists and is not this checkout ($here): cannot link it" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$built_in")" && ln -sfn "$here" "$built_in"
fi
data=$(dirname "$built_in")/shared/data
if [ -d "$g/trajectory-gpt2" ] && [ ! -e "$data/trajectory-gpt2" ]; then
    mkdir -p "$data" && ln -sfn "$g/trajectory-gpt2" "$data/trajectory-gpt2"
fi
# Vulkan's loader for wgpu (the image has the NVIDIA driver's ICD but maybe no loader).
for f in .gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -e "$icd" ] && export VK_DRIVER_FILES=$icd
if ! ldconfig -p | grep -q 'libnvrtc.so'; then
    nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | head -1)
    [ -n "$nv" ] && export LD_LIBRARY_PATH=$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "nvrtc: ${nv:-on the library path}; cuda: $(ldconfig -p | grep -m1 'libcuda.so')"
cd "$built_in" || exit 1
"$g/xtask" gpu-check --prebuilt "$g" "${@:2}" "$data/trajectory-gpt2"
