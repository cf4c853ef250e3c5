"""The RetrievalGateway: the FastAPI app, bearer-token scopes, its HTTP protocol, and the processes that serve it."""
