"""The serving path: models behind one interface, ranking, the ranking service, the predictor
agent, the model registry and hot reload."""
