"""The charts: series in, figure out. Pure functions of plain data (numpy,
Plotly, the trainer's metric registry and statistics); no Django, no ORM, no
request. Downsampling (``downsample``), seed aggregation, colours and layout
(``style``), the figure families (``figures``), the stability table, the causal
and survival panels, and figure exports."""
