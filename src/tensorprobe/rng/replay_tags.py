"""Tags replay puts on records (shared by replay and the diff integration)."""

TAG_REPLAYED = "replayed"
