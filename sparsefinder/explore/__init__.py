"""View-models of the app's pages: everything the app shows, computed where a test can reach.

No Plotly and no Streamlit here (figures live in :mod:`sparsefinder.figures`, widgets in
``app/``). One module per job:

- ``state``: the view state a URL reproduces, and the predictor spec it stands for;
- ``inputs``: example texts, uploads, notes about a text, token labels;
- ``prepared``: a text's gold graphs, inputs and scorer, made once;
- ``live``: state → spec → masks → scores (the same calls as ``pareto.sweep``);
- ``accuracy``: what the setting costs the model's output on the text (a restricted run);
- ``tables``: per-head metrics, diffs, edge/token tables, downloads, highlighted text;
- ``corpus``: validation-corpus gold graphs and sweeps with progress;
- ``clusters`` / ``coref``: the Clusters and Coreference pages.
"""
