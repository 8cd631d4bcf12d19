"""Audio: PCM formats and resampling, voice activity, turn segmentation, the shared listener."""
