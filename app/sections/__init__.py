"""Each topic page's sections (the parts a page file composes), one module per page."""
