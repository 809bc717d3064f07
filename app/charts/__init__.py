"""Chart builders: pure functions from records (or configs) to Plotly figures, one file per family.

They never set fonts or heights; `app.theme.show_figure` does, so every chart shares one look.
"""
