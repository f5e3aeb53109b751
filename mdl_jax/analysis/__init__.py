"""Analyses of records: metrics, tables, figures and the report (imports the controller and pipeline).

  report.py   RQ1: Tables 4-5, Figure 3, REPORT.md
"""
