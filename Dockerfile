# Image of the LEAP workers (see docker-compose.yml).
FROM python:3.11-slim

# LightGBM's wheel links against the OpenMP runtime, which the slim image lacks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Only what the package needs, so that editing tests or docs does not rebuild the image.
COPY pyproject.toml README.md ./
COPY leap ./leap
COPY streams ./streams
COPY features ./features
COPY predictor ./predictor
RUN pip install --no-cache-dir .

RUN useradd --create-home --uid 10001 leap && mkdir -p /leap && chown leap /leap
USER leap
ENV LEAP_HOME=/leap
CMD ["leap", "--help"]
