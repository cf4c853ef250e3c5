"""The RetrievalGateway (spec 03): the FastAPI app, bearer-token scopes, its HTTP protocol, and the processes that serve it."""
