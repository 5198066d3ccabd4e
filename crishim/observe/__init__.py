"""What crishim tells the outside about itself while it runs: Prometheus metrics
(`metrics`) and the bus that carries container events to GetContainerEvents subscribers
(`events`). Managers publish into these; nothing here calls back into them.
"""
