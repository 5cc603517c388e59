# One image for every Infernix service; docker-compose.yml picks the command.
FROM python:3.11-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends git gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# On a GPU host pip takes torch's CUDA build; scripts/install.sh documents the pins.
RUN bash scripts/install.sh
ENV PYTHONUNBUFFERED=1
EXPOSE 8000 50051 50052
CMD ["infernix", "serve", "--host", "0.0.0.0"]
