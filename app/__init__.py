"""The fednovelty dashboard, installed as ``fednovelty.dashboard``: ``Home.py`` (the first
page), ``pages/`` (the other pages) and ``fednovelty_app`` (their helpers). ``fednovelty app``
runs ``streamlit run`` on ``Home.py``; Streamlit puts this folder on ``sys.path``, so the
pages import ``fednovelty_app`` alike from the checkout and from an installed wheel. Nothing
imports this package itself."""
