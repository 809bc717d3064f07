"""Pure computations over model configs and StepRecords (no Streamlit, no plotting)."""
