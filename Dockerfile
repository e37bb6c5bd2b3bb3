# towerflow on GPUs: TensorFlow's own CUDA image, at the version towerflow pins.
# Build:  docker build -t towerflow .
# Run:    docker run --gpus all -v /data:/data towerflow --num_gpus=4 --train_data=/data/train-* \
#           --eval_data=/data/validation-* --num_classes=1000 --label_offset=1 --model=resnet50 \
#           --image_size=224,224 --model_dir=/data/runs/r50
FROM tensorflow/tensorflow:2.21.0-gpu

WORKDIR /opt/towerflow
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOWERFLOW_CACHE=/var/cache/towerflow

# Metadata first, so the dependency layer is cached across source edits.
COPY setup.cfg pyproject.toml README.md ./
COPY trainer/ trainer/
COPY models/ models/
COPY data/ data/
COPY tasks/ tasks/
COPY launch/ launch/
COPY benchmarks/ benchmarks/
RUN python -m pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 towerflow \
    && mkdir -p /var/cache/towerflow \
    && chown towerflow /var/cache/towerflow

USER 1000
ENTRYPOINT ["python", "-m", "trainer"]
CMD ["--num_gpus=1"]
