from analyzer.cli import app

app(prog_name="model-analyzer")
