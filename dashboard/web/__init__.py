"""The pages: views (``views``), URLs (``urls``), the schema-generated run form
(``schema_form``), templates and static files, and plotly.js served from the
installed package (``staticfiles``)."""
