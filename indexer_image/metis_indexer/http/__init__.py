"""The indexer's HTTP edge as data: a route is declared once (`routes.Route`), and the
app's router (`routes.register`), the OpenAPI document (`openapi.document`) and the codes
each route answers are made from that one table (`api.ROUTES`)."""
