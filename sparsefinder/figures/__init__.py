"""Every Plotly figure of Sparsefinder, one module per subject (drawing only).

``common`` (colours, config, PNG images, HTML export), ``graphs`` (head, overview, token row),
``pareto`` (sparsity–recall curves), ``accuracy`` (sparsity–accuracy panels), ``clusters``
(POS × cluster bars), ``coref`` (pronoun rows).
"""
