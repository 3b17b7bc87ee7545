# Metronome in a container, built from this checkout on Debian 12.
#
#   docker build -t metronome .
#   docker run --rm -p 8080:8080 metronome
#   docker run --rm -p 8080:8080 -v /models/Llama-3.1-8B-Instruct:/model:ro metronome --model /model
#
# The packages are those of tools/build.sh, less those only its tests use
# (the "test-only" line below); tests/packaging/check_dockerfile.sh fails
# when a package of build.sh is in neither list, or the image installs one
# build.sh does not. The build is CPU-only by default; --build-arg METRONOME_CUDA=ON
# builds the CUDA executor, which needs nvcc at /usr/local/cuda: pass
# --build-arg BASE_IMAGE=<a Debian 12 image with the CUDA toolkit> and run
# with --gpus. The default model is models/metronome-tiny when the checkout
# has it; otherwise pass --model.
ARG BASE_IMAGE=debian:bookworm
FROM ${BASE_IMAGE}

ARG METRONOME_CUDA=OFF
ARG METRONOME_CUDA_ARCHITECTURES=90

# Packages of tools/build.sh that only its tests use (the browser test, the
# Prometheus scrape test), not installed here:
# test-only: chromium prometheus
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      cmake ninja-build g++ pkg-config git \
      libcaf-dev libboost1.81-dev libyaml-cpp-dev libspdlog-dev libfmt-dev \
      nlohmann-json3-dev libsimdjson-dev libcli11-dev libpcre2-dev libgtest-dev libgmock-dev libssl-dev openssl \
      python3 python3-prometheus-client \
 && rm -rf /var/lib/apt/lists/*

COPY . /src
RUN cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRONOME_TESTS=OFF \
      -DMETRONOME_CUDA=${METRONOME_CUDA} \
      -DMETRONOME_CUDA_ARCHITECTURES=${METRONOME_CUDA_ARCHITECTURES} \
 && cmake --build /build \
 && cmake --install /build --prefix /usr/local \
 && rm -rf /build

# A user of its own; the server needs no privilege.
RUN useradd --system --home-dir /var/lib/metronome --create-home --shell /usr/sbin/nologin metronome
USER metronome
WORKDIR /var/lib/metronome

EXPOSE 8080
# /health answers 200 once the model is loaded (503 while loading or draining).
STOPSIGNAL SIGTERM
ENTRYPOINT ["metronome", "serve", "--host", "0.0.0.0"]
