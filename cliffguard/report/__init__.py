"""``cliffguard report RUN``: a run's post-mortem as data (``data.py``) and as one self-contained
HTML page (``html.py``, with inline SVG plots drawn by ``svg.py``)."""
