"""From traces to numbers: serving metrics, paired statistics, tables and figures."""
