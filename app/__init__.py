"""InferScope's Streamlit layer: the entry point, per-session engine lifecycle, shared widgets and
chart builders. Pages in `pages/` stay thin and compose what lives here."""
