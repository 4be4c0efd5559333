server {
  claim_resume_timeout = "-1s"
}