# Image for the team deployment (docker-compose.yml): web, workers and reconciler.
# GPU hosts: build from a CUDA base with a CUDA torch wheel, e.g.
#   docker build --build-arg BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime .
ARG BASE=python:3.11-slim
FROM ${BASE}
ENV PYTHONUNBUFFERED=1 PYTHONPATH=/app/platform:/app LAB_VAR_DIR=/data
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir -e . && mkdir -p /data
EXPOSE 8000
