"""Home: what InferScope is and what is live."""
from app.sections.home import render_home

render_home()
