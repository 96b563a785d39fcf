"""File formats: what barerl writes to disk and reads back (checksums of checkpoint files, ...)."""
