"""Importers written in Python (run as modules; `shardfeed pack --from KIND` runs them):
parquet (parquet files and Hugging Face datasets saved with save_to_disk, through pyarrow)."""
